// A measurement probe (tests/kernels.rs `grid_sync_floor`, ignored): `phases` steps of trivial
// work in ONE dispatch of `wgs` workgroups, separated by a grid-wide barrier made of a global
// atomic counter each workgroup adds to and then spins on (monotonic: phase k waits for
// (k + 1) * wgs arrivals, so nothing is reset between phases). What a persistent decode kernel
// would pay per phase instead of a dispatch and a pipeline barrier. Only valid when every
// workgroup is resident at once (the caller keeps wgs below the device's capacity); the spin
// is bounded, and a phase that times out, or a workgroup that reads a neighbour's word from
// the wrong phase, is counted in `bad`.
#version 450

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) coherent buffer Sync { uint arrived; uint bad; uint words[]; };
// The same counter read by plain (volatile) loads while waiting: POLL_RMW polls with atomic
// adds of 0 instead (every poll a read-modify-write on one word).
layout(std430, set = 0, binding = 0) volatile coherent buffer SyncV { uint arrived_v; };

layout(push_constant) uniform Push {
    uint phases;
    uint wgs;
} p;

shared bool timed_out;

void main() {
    uint wg = gl_WorkGroupID.x;
    uint t = gl_LocalInvocationID.x;
    for (uint k = 0u; k < p.phases; k++) {
        // The phase's work: each workgroup stamps its word with the phase.
        if (t == 0u) words[wg] = k + 1u;
        memoryBarrierBuffer();
        barrier();
        if (t == 0u) {
            atomicAdd(arrived, 1u);
            uint target = (k + 1u) * p.wgs;
            uint spins = 0u;
#ifdef POLL_RMW
            while (atomicAdd(arrived, 0u) < target && spins < (1u << 20)) spins++;
#else
            while (arrived_v < target && spins < (1u << 20)) spins++;
#endif
            timed_out = spins >= (1u << 20);
            memoryBarrierBuffer();
            // After the barrier every workgroup's word holds this phase or the next.
            uint w = words[(wg + 1u) % p.wgs];
            if (timed_out || w < k + 1u) atomicAdd(bad, 1u);
        }
        barrier();
        if (timed_out) return;
    }
}
