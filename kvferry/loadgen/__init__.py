"""The load generator behind `kvferry loadgen`, also a library for the benchmark scripts: datasets with exact
token counts, a streaming OpenAI client, bounded load shapes, metrics with goodput, reports and plots."""
