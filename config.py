"""pyinfra CLI configuration, read from the directory pyinfra starts in.

Nothing here changes how pyinfra runs by default: the inventory is validated by deploy.py before
any operation (spark/inventory.py), and pyinfra reads facts one command each, as it always does.
SPARK_FACTCACHE=on opts in to batched fact reads (operations/factcache.py), which replaces parts
of pyinfra's own objects and is therefore switched on only for the pyinfra release it was written
against (requirements.txt pins it).
"""

from pyinfra import state

from operations.factcache import batch_fact_reads

batch_fact_reads(state)
