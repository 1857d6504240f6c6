"""Steps `rollout-stage`, `analyze`, `promote`, `rollback` and `retire`: the staged rollout, one tick per step.

Every step reads the durable rollout record, decides with the pure state machine, moves traffic first,
then stores the new state. A step that crashed is rerun from the stored state; a rerun of a step that
finished returns what it did before. A rollback of everything is the one decision stored before traffic
moves, as `rolling_back` (so no stage opens and no promotion happens meanwhile); it becomes `rolled_back`
only once routing reads back with nothing on the candidate, and any later `rollback` or `analyze` finishes it.

One module per command: `stage`, `analyze`, `answer` (a human's answer to a stage's question), `rollback`,
`promote`, `status`.
"""

from mlrelease.steps.rollout.analyze import analyze
from mlrelease.steps.rollout.answer import answer
from mlrelease.steps.rollout.promote import promote, promote_paused, retire
from mlrelease.steps.rollout.rollback import rollback, rollback_all, rollback_to
from mlrelease.steps.rollout.stage import rollout_stage
from mlrelease.steps.rollout.status import status

__all__ = [
    "rollout_stage",
    "rollback_all",
    "rollback",
    "rollback_to",
    "analyze",
    "answer",
    "promote_paused",
    "promote",
    "retire",
    "status",
]
