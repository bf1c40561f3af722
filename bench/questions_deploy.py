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
said = ahead.say_every_stage(box, fleet.fleet)
first = next(question for questions in said for question in questions)
answered(name="Every stage's questions, in one command", question=first)
