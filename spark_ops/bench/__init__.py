"""Throughput sweep of a vLLM server (`spark-ops bench`).

Public API (import the submodules; nothing heavy is imported here):
- sweep.run_sweep(SweepConfig, *, on_level=None) -> SweepResult (to_dict / from_dict)
- stats: percentile, steady_window, knee, slo_max_concurrency, tail_fraction, detect_cap,
  summarize_run, summarize_level, read_levels
- report: sweep_table, render_text, reading_lines, write_json, write_csv, load_result, compare
- plot.plot_sweep(result, path); client.StreamClient; workload.load_prompts / build_payload
- openloop.run_rates(RateConfig) -> RateResult (open loop: seeded arrivals at a rate, goodput);
  ratelevel.Slo; ratereport: rate_table, render_rate_text, write_rate_json, write_rate_csv
- load: the one request loop (open_client, Bodies, send_at: open loop, send_closed: C in flight)
- gate: measure(endpoint, LoadPoint) -> Measurement; prove(before, after, Thresholds) -> Verdict
"""
