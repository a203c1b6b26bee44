"""The benchmark suite's harness: what every benchmark under benchmarks/ shares.

- schema: the result every benchmark writes (benchmark, created, command, environment, params, rows,
  baseline, summary, notes);
- results: making a result, and writing it to benchmarks/results/NAME.json (or another folder);
- cli: each benchmark's argument parser, with --results-dir;
- environment: the facts of the machine a result was measured on, cached test checkpoints, and a copy of
  one with a longer context;
- side_by_side: several variants measured in one run, in alternating order, and ratios to a baseline;
- warmup: warm-up runs kept out of the timed ones;
- processes: child processes started with a log, waited on, and stopped;
- plot: a plot when matplotlib is installed, a message when it is not;
- table: a results table on the terminal.
"""
