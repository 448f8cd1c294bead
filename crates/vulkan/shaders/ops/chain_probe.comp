// A measurement probe (tests/kernels.rs `persistent_chain_probe`, ignored): what a persistent
// token command would save on its chain of matrix products. Stage s is a one-row product
// y_s = W_s x_s over int8 weights (16 a uvec4, a scale of 1), its rows spread over the
// workgroups a subgroup a row at a time; its output is the next stage's input (x regions of
// `xs` floats). Stages lo..hi run in this dispatch: between two of them every workgroup waits
// at a grid-wide barrier (grid_sync.comp's monotonic counter), so one dispatch of every stage
// costs what a persistent command's matrix chain would, against one dispatch a stage chained
// by pipeline barriers. AHEAD: before it waits, each subgroup loads its first row of the next
// stage into registers (the weights do not depend on the stage before), as a persistent
// command would keep the memory busy across a stage's end. Only valid with every workgroup
// resident at once (the caller keeps the count below the device's capacity); a wait past its
// bound is counted in `bad` and ends the dispatch.
#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer W { uvec4 w[]; };
// Per stage: rows, cols, the weights' first uvec4, 0.
layout(std430, set = 0, binding = 1) readonly buffer St { uvec4 st[]; };
layout(std430, set = 0, binding = 2) coherent buffer X { float x[]; };
layout(std430, set = 0, binding = 3) coherent buffer Sync { uint arrived; uint bad; };
layout(std430, set = 0, binding = 3) volatile coherent buffer SyncV { uint arrived_v; };

layout(push_constant) uniform Push {
    uint lo;
    uint hi;
    uint xs;   // floats an x region
} p;

// uvec4 chunks of a row a lane holds (cols up to 16 * MAXC * subgroup size, and MAXX).
#define MAXC 16u
#define MAXX 8192u   // floats of a stage's input (its cols), staged in shared memory
uvec4 ahead[MAXC];
shared bool timed_out;
shared float xsh[MAXX];

float dot16(uvec4 q, uint xo) {
    float s = 0.0;
    for (uint j = 0u; j < 4u; j++) {
        uint wd = q[j];
        for (uint b = 0u; b < 4u; b++) s += float(bitfieldExtract(int(wd), int(8u * b), 8)) * xsh[xo + 4u * j + b];
    }
    return s;
}

void load_row(uvec4 sd, uint row) {
    uint S = gl_SubgroupSize;
    uint per = sd.y / 16u / S;
    for (uint c = 0u; c < MAXC; c++)
        if (c < per) ahead[c] = w[sd.z + row * (sd.y / 16u) + c * S + gl_SubgroupInvocationID];
}

void main() {
    uint S = gl_SubgroupSize;
    uint nsg = gl_WorkGroupSize.x / S;
    uint g = gl_WorkGroupID.x * nsg + gl_SubgroupID;
    uint stride = gl_NumWorkGroups.x * nsg;
    uint lane = gl_SubgroupInvocationID;
    bool have = false;   // `ahead` holds this subgroup's first row of the stage
    for (uint s = p.lo; s < p.hi; s++) {
        uvec4 sd = st[s];
        uint per = sd.y / 16u / S;
        uint xo = (s + 1u) * p.xs;
        // The stage's input into shared memory (an L2 read a workgroup, not one a row).
        for (uint i = gl_LocalInvocationIndex; i < min(sd.y, MAXX); i += gl_WorkGroupSize.x) xsh[i] = x[s * p.xs + i];
        barrier();
        for (uint row = g; row < sd.x; row += stride) {
            if (!(have && row == g)) load_row(sd, row);
            float acc = 0.0;
            for (uint c = 0u; c < MAXC; c++)
                if (c < per) acc += dot16(ahead[c], 16u * (c * S + lane));
            float y = subgroupAdd(acc);
            if (lane == 0u && row < p.xs) x[xo + row] = y * (1.0 / 256.0);
        }
        have = false;
        barrier();   // every subgroup is done with xsh
        if (s + 1u == p.hi) break;
        // The grid barrier: every workgroup's outputs of stage s before any reads them.
        memoryBarrierBuffer();
        barrier();
#ifdef AHEAD
        if (g < st[s + 1u].x) {
            load_row(st[s + 1u], g);
            have = true;
        }
#endif
        if (gl_LocalInvocationIndex == 0u) {
            atomicAdd(arrived, 1u);
            uint target = (s + 1u - p.lo) * gl_NumWorkGroups.x;
            uint spins = 0u;
            while (arrived_v < target && spins < (1u << 22)) spins++;
            timed_out = spins >= (1u << 22);
            if (timed_out) atomicAdd(bad, 1u);
        }
        barrier();
        memoryBarrierBuffer();
        if (timed_out) return;
    }
}
