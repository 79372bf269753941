"""What a run writes: the result tables and console summary (results), results.json/.csv/.md and
requests.csv (results_files), AIPerf's export (aiperf_export), the SLO verdicts (slo)."""
