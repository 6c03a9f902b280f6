// Package vtc replays the VTC paper's workloads (Sheng et al., "Fairness
// in Serving Large Language Models", OSDI 2024) against an OpenAI chat
// endpoint and computes the paper's fairness metrics: reading a workload
// (workload.go), sizing the simulator to the paper's server and writing
// each row's prompt (sizing.go), Sluice's configuration for a replay
// (run.go), the replay itself (replay.go), the accumulated and windowed
// service differences (metrics.go) and the report's sections
// (report.go). sluice-bench fairness drives it on one process's stack,
// tests/multi on the cluster stack; both write the same report rows.
package vtc
