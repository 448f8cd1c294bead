// Merge the key pieces of decode attention: out = sum_p acc_p e^(m_p - M) / sum_p l_p e^(m_p - M).
// Workgroup (head, row).
#version 450

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(std430, set = 0, binding = 0) readonly buffer Part { float part[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Out { float outv[]; };

layout(push_constant) uniform Push {
    uint n_head;
    uint head_dim;
    uint n_pieces;
} p;

void main() {
    uint h = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    uint hd = p.head_dim;
    uint first = (r * p.n_head + h) * p.n_pieces;
    float mx = -1.0 / 0.0;
    for (uint i = 0u; i < p.n_pieces; i++) mx = max(mx, part[(first + i) * (hd + 2u)]);
    float l = 0.0;
    for (uint i = 0u; i < p.n_pieces; i++) {
        uint ob = (first + i) * (hd + 2u);
        if (part[ob + 1u] > 0.0) l += part[ob + 1u] * exp(part[ob] - mx);
    }
    for (uint d = t; d < hd; d += WG) {
        float a = 0.0;
        for (uint i = 0u; i < p.n_pieces; i++) {
            uint ob = (first + i) * (hd + 2u);
            if (part[ob + 1u] > 0.0) a += part[ob + 2u + d] * exp(part[ob] - mx);
        }
        outv[(r * p.n_head + h) * hd + d] = a / l;
    }
}
