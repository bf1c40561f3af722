"""pyinfra CLI configuration: refuse invalid inventory data before any host is contacted.

pyinfra runs this file first (from the directory it is started in), then loads the
inventory, then connects: the check hooks into the connect step. Fact reads are then
answered in batches (operations/factcache.py; SPARK_FACTCACHE=off turns that off).
"""

from pyinfra import state

from operations.config import validate_before_connect
from operations.factcache import batch_fact_reads

validate_before_connect(state)
batch_fact_reads(state)
