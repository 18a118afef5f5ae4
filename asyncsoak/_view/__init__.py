"""What a person reads.

The evidence, the summary, the live view, the HTML report, comparisons and several artifacts of
one job.
"""
