// Final logit soft-capping (gemma): x <- cap * tanh(x / cap) over `count` values, tanh(v)
// written as 1 - 2 / (exp(2v) + 1) so that a large |v| saturates instead of dividing
// infinities.
#version 450

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) buffer X { float x[]; };

layout(push_constant) uniform Push {
    uint count;
    float cap;
} p;

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= p.count) return;
    float v = x[i] / p.cap;
    x[i] = p.cap * (1.0 - 2.0 / (exp(2.0 * v) + 1.0));
}
