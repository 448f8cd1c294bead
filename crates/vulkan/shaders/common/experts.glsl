// The slot lists moe.comp GROUP writes (src/kernels.rs `Recorder::moe_group`): grp[e] ..
// grp[e + 1] is expert e's range of the lists at list_off, and from act_off the experts some
// slot chose, in index order, then NO_EXPERT. With EXPERT (mv.comp, mr.comp, mm.comp), after
// the includer's `grp` binding and push block (`p.act_off`, `p.rows`): `expert_slice`.
#ifndef RESIN_EXPERTS_GLSL
#define RESIN_EXPERTS_GLSL

#define NO_EXPERT 0xFFFFFFFFu   // GROUP's entry past the chosen experts

#ifdef EXPERT
// The chosen expert of this workgroup's z-slice: false past the last one (the whole workgroup
// leaves); else its first weight row in the stack, its first slot in the lists and its count.
bool expert_slice(out uint first_row, out uint first_slot, out uint count) {
    uint e = grp[p.act_off + gl_WorkGroupID.z];
    if (e == NO_EXPERT) return false;
    first_row = e * p.rows;
    first_slot = grp[e];
    count = grp[e + 1u] - first_slot;
    return true;
}
#endif

#endif
