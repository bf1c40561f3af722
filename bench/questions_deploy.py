"""Only the questions: pyinfra's start, the inventory validated and planned, the connection, and
each box asked every stage's questions in the one command a no-change deploy.py asks them in
(operations/asked.py), by one operation that changes nothing. The floor of a no-change run
through pyinfra: what deploy.py takes beyond it is its own operations' work."""

from pyinfra import host, inventory, state

from bench.ask_only import answered
from operations import asked
from stages import ahead, settings

fleet = settings.plan(inventory)
box = fleet.box(host.name)
asked.register(state)
groups = [group for group in ahead.every_stage(box, fleet.fleet) if group]
for questions in groups:
    asked.ahead(questions)
answered(name="Every stage's questions, in one command", question=groups[0][0])
