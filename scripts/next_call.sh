#!/usr/bin/env bash
# The next GPU call, as one `device` run (about 7 minutes; carry [".kit"], timeout 560):
#   bash scripts/next_call.sh > $OUT/next.log 2>&1; grep -E "rc |panicked|decode_tps|quiet|^end" $OUT/next.log
# Kit: bash scripts/make_kit.sh pre=b3b7118 main=HEAD (b3b7118: main before the nineteenth
# session's sampler list draw and device top-k selection; HEAD: with them and the named whole
# rows of mixed steps). It measures what landed without an H200 figure:
#   - the tests of what landed, on the GPU (rows_copy and top-k kernels, top steps with named
#     rows, in lanes too, mixed engine streams);
#   - sampled top_k-40 streams at 8 and 64, pre against main (the list draw and the selection);
#   - sampled streams of which some have a repetition penalty (their rows read back whole: 1
#     and 7 of 8, 4 of 64), main against main with the cut off (every row's logits: what a
#     mixed step read before);
#   - quiet resin bench pp512/tg128, pre and main;
#   - last (a timeout cuts it first): greedy 16 and 64 streams, lanes against one GEMM pass.
set -u
S=$SECONDS; K=.kit
for f in $K/t-*.gz; do gunzip -kf "$f" && chmod +x "${f%.gz}"; done
RESIN_GPU_TEST_TIMEOUT=150 bash scripts/gpu_tests.sh "kernels rows_copy" "kernels topk" "prefill top" "prefill a_wide_step" "engine sampled_streams"
echo "tests end at $((SECONDS - S)) s"
MODELS=llama3.2-1b-q8_0 WIDTHS_ARGS="--streams 8 --temperature 0.8 --top-k 40|--streams 64 --temperature 0.8 --top-k 40" \
  bash scripts/bench_gpu_host_split.sh $K/resin-pre $K/resin
MODELS=llama3.2-3b-q4_k_m WIDTHS_ARGS="--streams 8 --temperature 0.8 --top-k 40" bash scripts/bench_gpu_host_split.sh $K/resin-pre $K/resin
P="--temperature 0.8 --top-k 40 --repeat-penalty 1.1"
MODELS=llama3.2-1b-q8_0 WIDTHS_ARGS="--streams 8 $P --penalty-streams 1|--streams 8 $P --penalty-streams 7|--streams 64 $P --penalty-streams 4" \
  bash scripts/bench_gpu_host_split.sh $K/resin-topoff $K/resin
echo "streams end at $((SECONDS - S)) s"
for b in resin-pre resin; do
  for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
    timeout 60 $K/$b bench --model /tmp/w/$m.gguf --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --reps 3 --format json 2>/dev/null \
      | python3 -c "import json,sys; d=json.load(sys.stdin); print('quiet', sys.argv[1], sys.argv[2], 'pp', round(d['pp_tps']), 'tg', round(d['tg_tps']), 'greedy', d.get('tg_greedy_tps') and round(d['tg_greedy_tps']))" $b $m
  done
done
MODELS=llama3.2-1b-q8_0 WIDTHS_ARGS="--streams 16|--streams 64" bash scripts/bench_gpu_host_split.sh $K/resin $K/resin-fast
echo "end at $((SECONDS - S)) s"
