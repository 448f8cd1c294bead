#!/bin/bash
# The comparison in one short lease (LEASE_S seconds, default 480: one `device` call), for when
# the device budget cannot hold scripts/gpu/bench_gpu.sh's full peer build. resin runs (bench
# pp512/tg128 with the per-stage profile; 8, 16, 32 and 64 streams with wide steps and with
# groups of 8-row token commands) on `resin synth` files (or llama.cpp's, found in /tmp/w) while
# llama.cpp's CUDA build (llama-bench and llama-batched-bench only, niced, 12 jobs) compiles
# beside it; then the peer runs on the SAME files. Streams: wide steps (the Vulkan home's
# lanes, groups of token commands on several queues at once) against lanes on one queue
# (RESIN_VK_QUEUES=1, the control: the same work with no overlap) and the one-pass GEMM wide
# step (--wide-steps gemm). Each step
# is cut by `timeout` so the call ends in time. From the repo root on the device machine, the kit
# in .kit (scripts/gpu/make_kit.sh; RESIN_BIN names another resin binary than .kit/resin):
#   bash scripts/gpu/bench_gpu_lease.sh        results in $OUT/l and $OUT/final.tgz
# Two calls, for llama.cpp's Vulkan build as well (PEER_VK=1; the kit then holds vk-kit.tgz):
# STAGE=ours builds both peers (CUDA 10 jobs, Vulkan 6, niced) while resin runs, and waits for
# them until the lease ends; STAGE=peer, the next call on the still-warm machine (it keeps
# /tmp/w about 30 s after a call returns), runs resin's pp512/tg128 again on the quiet host, then
# the peers: llama-bench and llama-batched-bench, CUDA then Vulkan.
#   PEER_VK=1 STAGE=ours LEASE_S=590 bash scripts/gpu/bench_gpu_lease.sh
#   PEER_VK=1 STAGE=peer LEASE_S=590 bash scripts/gpu/bench_gpu_lease.sh
S=$SECONDS; W=/tmp/w; K=.kit; O=$OUT/l; mkdir -p $O $W
L=${LEASE_S:-480}
R=${RESIN_BIN:-$K/resin}   # the resin binary measured
left() { local t=$(($1 - (SECONDS - S))); [ $t -lt 1 ] && t=1; echo $t; }
bash $K/peer.sh $K $W gl >/dev/null
OUT=$O bash scripts/gpu/bench_gpu.sh $K $W synth > $O/synth.txt 2>&1
STAGE=${STAGE:-all}
# j: one resin bench run, its key figures on one line (env overrides before the command).
j() { local tag=$1; shift; timeout 90 env "$@" > $O/$tag.json 2> $O/$tag.log; echo "$tag: $(grep -o -E '"(pp_tps|tg_tps|tg_greedy_tps|decode_tps|full_width_decode_tps|ttft_p50_s)":[0-9.a-z]*' $O/$tag.json | tr "\n" " ")"; }
. "$(dirname "$0")/llama_cmake.sh"; C=$LLAMA_CMAKE
if [ $STAGE != peer ]; then
# The peer's build left the ours stage 10 s to write its results (the all stage 90 s for the peer's runs).
BL=$([ $STAGE = ours ] && echo 10 || echo 90)
( cmake -S $W/llama.cpp -B $W/bc $C $LLAMA_CUDA > $O/cmake.log 2>&1 &&
  timeout $(left $((L - BL))) nice -n 19 cmake --build $W/bc -j $([ -n "$PEER_VK" ] && echo 10 || echo 12) --target llama-bench llama-batched-bench > $O/build.log 2>&1 ) &
B=$!
if [ -n "$PEER_VK" ]; then
  # llama.cpp's Vulkan build as .kit/peer.sh's build_vk makes it (glslc, headers and loader from vk-kit.tgz)
  ( k=$W/vkkit; mkdir -p $k && tar xzf $K/vk-kit.tgz -C $k && dpkg -x $k/libvulkan-dev_*.deb $k/dev &&
    cmake -S $k/spirv-headers -B $k/sh-build -DCMAKE_INSTALL_PREFIX=$k/prefix -DSPIRV_HEADERS_ENABLE_TESTS=OFF > /dev/null && cmake --install $k/sh-build > /dev/null &&
    ln -sf /lib/x86_64-linux-gnu/libvulkan.so.1 $k/prefix/libvulkan.so &&
    cmake -S $W/llama.cpp -B $W/bv $C -DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR=$k/vkheaders -DVulkan_LIBRARY=$k/prefix/libvulkan.so \
      -DVulkan_GLSLC_EXECUTABLE=$k/glslc -DCMAKE_PREFIX_PATH=$k/prefix -DCMAKE_CXX_FLAGS="-I$k/prefix/include" > $O/cmake-vk.log 2>&1 &&
    timeout $(left $((L - BL))) nice -n 19 cmake --build $W/bv -j 6 --target llama-bench llama-batched-bench > $O/build-vk.log 2>&1 ) &
  BV=$!
fi
for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
  RB="$R bench --model $W/$m.gguf --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --format json"
  j resin-$m A=1 $RB --reps 3 --profile
  if [ -n "$Q8KV" ]; then j resin-$m-q8kv A=1 $RB --kv q8_0 --reps 1; fi   # the q8_0 K/V mirror
  # aggregate decode: every decoding row in one step (lanes above 8 rows)
  for n in 8 16 32 64; do
    j streams-$m-$n-wide A=1 $RB --streams $n --reps 1
  done
  j streams-$m-16-q1 RESIN_VK_QUEUES=1 $RB --streams 16 --reps 1
  j streams-$m-64-gemm A=1 $RB --streams 64 --reps 1 --wide-steps gemm
  # TTFT of 8 prompts arriving together, one at a time (segmented is the 8-stream run above)
  j streams-$m-8-seg1 A=1 $RB --streams 8 --max-segments 1 --reps 1
done
echo "ours done at $((SECONDS - S)) s"
wait $B || { echo "peer build cut or failed at $((SECONDS - S)) s"; tail -3 $O/build.log; }
echo "peer built at $((SECONDS - S)) s"
if [ -n "$PEER_VK" ]; then
  wait $BV || { echo "peer Vulkan build cut or failed at $((SECONDS - S)) s"; tail -3 $O/build-vk.log; }
  echo "peer Vulkan built at $((SECONDS - S)) s"
fi
fi
if [ $STAGE = ours ]; then tar czf $OUT/final.tgz -C $OUT l; exit 0; fi
# pb BUILD_DIR TAG RESERVE: the peer's llama-bench and llama-batched-bench on both files, each
# cut to leave RESERVE seconds of the lease for what follows.
pb() {
  [ -x $1/bin/llama-bench ] || { echo "no peer build in $1"; return; }
  for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
    timeout $(left $(($3 + 60))) $1/bin/llama-bench -m $W/$m.gguf -p 512 -n 128 -r 3 -fa 1 -o md > $O/peer-$2-bench-$m.log 2>&1
    echo "rc $?"; grep -E "^\||error" $O/peer-$2-bench-$m.log | tee -a $O/peer-$2-bench.md
  done
  # -npl 1 twice: the Vulkan build compiles its pipelines on first use, which lands in the first row
  for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
    timeout $(left $3) $1/bin/llama-batched-bench -m $W/$m.gguf -c 40000 -b 2048 -ub 512 -npp 512 -ntg 128 -npl 1,1,8,16,32,64 -fa on > $O/peer-$2-batched-$m.log 2>&1
    echo "rc $?"; grep -E "^\||error" $O/peer-$2-batched-$m.log | tee -a $O/peer-$2-batched.md
  done
}
# A build the ours stage's lease cut short goes on here, on every core.
if [ $STAGE = peer ]; then
  for d in bc bv; do
    if [ -d $W/$d ] && [ ! -x $W/$d/bin/llama-batched-bench ]; then
      timeout $(left $((L / 2))) cmake --build $W/$d -j $(nproc) --target llama-bench llama-batched-bench > $O/build-resume-$d.log 2>&1; echo "$d build resumed to $((SECONDS - S)) s: rc $?"
    fi
  done
fi
# resin's single stream again on a quiet host (the ours stage's ran beside the peers' builds,
# and a token that reads its logits back waits on host work): the figures to set beside the peer's.
for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
  j resin-quiet-$m A=1 $R bench --model $W/$m.gguf --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --format json --reps 3
done
pb $W/bc cuda $([ -n "$PEER_VK" ] && echo $((L / 2)) || echo 10)
[ -n "$PEER_VK" ] && pb $W/bv vulkan 10
echo "end at $((SECONDS - S)) s"
tar czf $OUT/final.tgz -C $OUT l
