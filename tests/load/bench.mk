# The benchmark scenarios' make targets, generated from sluice-bench's
# scenario list by `make bench-targets` (tests/load/cmd/sluice-bench/list.go):
# edit the scenarios' Specs, not this file; go test
# ./tests/load/cmd/sluice-bench/ fails when it is not what they generate.

# make bench runs these, in this order, after bench-go.
BENCH_TARGETS := bench-overhead bench-limiter bench-reject bench-wakeup bench-burst bench-waiters bench-heal bench-goodput bench-pools bench-slo bench-slo-vtc bench-fairness bench-fairness-1024 bench-fairness-omitted
# These run only on their own.
BENCH_ALONE := bench-soak

.PHONY: $(BENCH_TARGETS) $(BENCH_ALONE)

# sluice-bench overhead: what Sluice adds on top of the LLM, vs a bare
# Temporal workflow (default). Writes tests/load/report/overhead.md.
bench-overhead: need $(TEMPORAL) build
	$(BIN)/sluice-bench overhead -temporal $(TEMPORAL) -n 200 -report tests/load/report/overhead.md

# sluice-bench limiter: limiter.Reserve decisions/s vs redis-benchmark SET;
# p99 at half that rate. Writes tests/load/report/limiter.md.
bench-limiter: need $(TEMPORAL) build
	$(BIN)/sluice-bench limiter -temporal $(TEMPORAL) -report tests/load/report/limiter.md

# sluice-bench reject: 429 path through POST /v1/chat: rejections/s,
# latency, no workflow started. When wrk is installed (apt-get install wrk)
# it drives the API with it too: a client light enough to leave the server
# the CPU. Writes tests/load/report/reject.md.
bench-reject: need $(TEMPORAL) build
	$(BIN)/sluice-bench reject -temporal $(TEMPORAL) -report tests/load/report/reject.md

# sluice-bench wakeup: permit release to the next waiter's retrieval stage,
# end to end. Writes tests/load/report/wakeup.md.
bench-wakeup: need $(TEMPORAL) build
	$(BIN)/sluice-bench wakeup -temporal $(TEMPORAL) -report tests/load/report/wakeup.md

# sluice-bench burst: 2,000 concurrent SSE clients against 20 permits:
# outcomes, hangs, leaks. Writes tests/load/report/burst.md.
bench-burst: need $(TEMPORAL) build
	$(BIN)/sluice-bench burst -temporal $(TEMPORAL) -report tests/load/report/burst.md

# sluice-bench waiters: 10,000 queued workflows on one worker: RSS,
# goroutines, drain. About 15 minutes. Writes tests/load/report/waiters.md.
bench-waiters: need $(TEMPORAL) build
	$(BIN)/sluice-bench waiters -temporal $(TEMPORAL) -report tests/load/report/waiters.md

# sluice-bench heal: 80% short / 20% long on one simulator, healing off then
# on: short P99/P50 over time. About 4 minutes; writes
# tests/load/report/heal.{md,csv,png}.
bench-heal: need $(TEMPORAL) build
	$(BIN)/sluice-bench heal -temporal $(TEMPORAL)

# sluice-bench goodput: goodput and TTFT against offered load, closed and
# open loop, Sluice vs a bare workflow. About 10 minutes; writes
# tests/load/report/goodput.{md,csv,png}.
bench-goodput: need $(TEMPORAL) build
	$(BIN)/sluice-bench goodput -temporal $(TEMPORAL)

# sluice-bench pools: two equal tenants, one per pool, on make run's shared
# pools vs pools apart: token shares, TTFT. Writes
# tests/load/report/pools.md.
bench-pools: need $(TEMPORAL) build
	$(BIN)/sluice-bench pools -temporal $(TEMPORAL) -report tests/load/report/pools.md

# sluice-bench slo: SLO attainment by tier at 0.5×–2× capacity over 5
# seeds: Sluice without and with preemption vs FCFS straight to the
# simulator, beside the ceiling without preemption. Every answer 128 tokens.
# About 40 minutes (4 loads × 5 seeds × 3 modes); SLO_FLAGS adds flags
# (say -seeds 1 -loads 2 for a smoke run). Writes tests/load/report/slo.md.
bench-slo: need $(TEMPORAL) build
	$(BIN)/sluice-bench slo -temporal $(TEMPORAL) $(SLO_FLAGS) -report tests/load/report/slo.md

# sluice-bench slo: SLO attainment by tier at 0.5×–2× capacity over 5
# seeds: Sluice without and with preemption vs FCFS straight to the
# simulator, beside the ceiling without preemption. Answer lengths drawn
# from the VTC real trace's (../shared/workloads/vtc-real.csv, beside the
# checkout; mean 256 tokens). About 45 minutes (4 loads × 5 seeds × 3
# modes); SLO_FLAGS adds flags. Writes tests/load/report/slo-vtc.md.
bench-slo-vtc: need $(TEMPORAL) build
	$(BIN)/sluice-bench slo -temporal $(TEMPORAL) -workload vtc $(SLO_FLAGS) -report tests/load/report/slo-vtc.md

# sluice-bench fairness: the VTC paper's workloads replayed: token fairness
# of Sluice vs FCFS vs the paper's numbers. The workloads
# (../shared/workloads: vtc-overload.csv and vtc-real.csv, beside the
# checkout) are replayed 4x faster than recorded on one simulator per
# workload sized as the paper's server (~15 minutes). FAIRNESS_FLAGS adds
# flags (say -max-tokens-mode 1024, or -duration 120 for a smoke run).
# Writes tests/load/report/fairness.md.
bench-fairness: need $(TEMPORAL) build
	$(BIN)/sluice-bench fairness -temporal $(TEMPORAL) $(FAIRNESS_FLAGS) -report tests/load/report/fairness.md

# sluice-bench fairness: the VTC paper's workloads replayed: token fairness
# of Sluice vs FCFS vs the paper's numbers. Both workloads with max_tokens
# 1024 for every request (the paper's VTC without the output length known;
# ~15 minutes). Writes tests/load/report/fairness-1024.md.
bench-fairness-1024: need $(TEMPORAL) build
	$(BIN)/sluice-bench fairness -temporal $(TEMPORAL) -max-tokens-mode 1024 -report tests/load/report/fairness-1024.md

# sluice-bench fairness: the VTC paper's workloads replayed: token fairness
# of Sluice vs FCFS vs the paper's numbers. Both workloads with no
# max_tokens in any request (the paper's VTC without the output length
# known; ~15 minutes). Writes tests/load/report/fairness-omitted.md.
bench-fairness-omitted: need $(TEMPORAL) build
	$(BIN)/sluice-bench fairness -temporal $(TEMPORAL) -max-tokens-mode omitted -report tests/load/report/fairness-omitted.md

# sluice-bench soak: 30 minutes at the pool's capacity: every process's
# memory, goroutines and workflow cache level off. make run's shape (the API
# with its embedded worker, and a worker, as processes of their own) at the
# short pool's capacity, every process's memory, goroutines and workflow
# cache sampled; the verdict is on the last 20 minutes. Writes
# tests/load/report/soak.{md,csv,png}. Not part of make bench: it takes 32
# minutes on its own.
bench-soak: need $(TEMPORAL) build
	$(BIN)/sluice-bench soak -temporal $(TEMPORAL)
