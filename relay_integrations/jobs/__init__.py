"""What the offline jobs (``relaygen calibrate``, ``relaygen bench`` and the benchmarks)
share, below all of them: problem sets and their errors (:mod:`.datasets`), resumable JSON
Lines records (:mod:`.records`), bounded concurrency (:mod:`.concurrency`), progress lines
(:mod:`.progress`) and the optional plotting backend (:mod:`.plotting`)."""
