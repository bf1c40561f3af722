"""pyinfra CLI configuration: refuse invalid inventory data before any host is contacted.

pyinfra runs this file first (from the directory it is started in), then loads the
inventory, then connects: the check hooks into the connect step.
"""

from pyinfra import state

from operations.config import validate_before_connect

validate_before_connect(state)
