"""The one operation of bench/questions_deploy.py (a module of its own: a deploy file runs as it
is read, this one can be imported and tested)."""

from pyinfra.api import operation

from operations import asked
from operations.asked import Question


@operation()
def answered(question: Question):
    """Reads one question through the ask-once layer, changing nothing: the box's first read
    asks every question its stages said ahead, in one command."""
    fact, arguments = question
    asked.answer(fact, **dict(arguments))
    yield from ()
