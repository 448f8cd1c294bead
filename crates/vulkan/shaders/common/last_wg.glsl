// The last workgroup to finish: each workgroup of a set counts itself in a word of the
// including shader's `done_wgs` (coherent, zero between dispatches) once its writes are
// visible, and the one that brings the count to `count` goes on to read the others' writes
// (a merge, a sum, a route, a pack) with no dispatch and barrier of its own. Every thread of
// the workgroup calls it (barriers).
shared bool last_wg;

// True in the workgroup that finishes `count` last, which leaves word `at` zero and sees the
// others' writes; false in the rest.
bool finishes_last(uint at, uint count, uint t) {
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) last_wg = atomicAdd(done_wgs[at], 1u) == count - 1u;
    barrier();
    if (!last_wg) return false;
    memoryBarrierBuffer();
    if (t == 0u) done_wgs[at] = 0u;
    return true;
}
