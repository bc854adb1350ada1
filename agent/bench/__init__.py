"""Benchmarks: workloads as data, fio and db_bench runners, safety, energy, fairness, sweeps."""
