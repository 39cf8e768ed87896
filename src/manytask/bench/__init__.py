"""`manytask bench`: the speed ratios that matter, each measured side by side in one process (`harness`), with the
yardsticks they are measured against (`timing`), kernel counts per round (`kernels`), the compute limit of a
round (`compute_limit`), the paper-scale members (`paper_scale`) and the printed tables (`tables`)."""
