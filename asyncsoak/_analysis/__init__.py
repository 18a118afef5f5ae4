"""Judgement over time.

The trend estimator and the fold of a run's series that the trend rules read.
"""
