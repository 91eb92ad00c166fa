"""``make bench``: the performance figures of docs/benchmarks.md (ARCHITECTURE.md section 6).

Run ``python -m benchmarks`` (CPU figures 1-5, then the report) or ``python -m benchmarks
--device cuda --out DIR`` on the H200 (figure 6, JSON only: needs torch and this repo).
"""
