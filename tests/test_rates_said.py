"""The rates a bulk job ends with: a slow job's are not rounded to 0."""
from spanflow.cli.common import rates_said


def test_a_slow_jobs_rates_keep_two_significant_digits():
    # 2 texts of a 5 MB line in 80 s: "0 texts/s" before
    assert rates_said(2, 80.0, 1_000_000, 1.0).startswith("in 1m 20s: 0.025 texts/s, 12500 real tokens/s")
    assert rates_said(1201, 1.0, 23190, 0.913) == ("in 1.0 s: 1201 texts/s, 23190 real tokens/s, "
                                                   "padding efficiency 0.913")
    assert "3.5 texts/s" in rates_said(7, 2.0, 70, 1.0) and ": 0 texts/s" in rates_said(0, 2.0, 0, 1.0)
    assert ": 0.00028 texts/s" in rates_said(1, 3600.0, 10, 1.0)  # no 2.8e-04, no 0.0003
    assert ": 0.01 texts/s" in rates_said(1, 100.0, 10, 1.0)
