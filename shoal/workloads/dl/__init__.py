"""Deep-learning training as task graphs: data, pipeline and hybrid parallelism on a pilot.

::

    from shoal.workloads import dl
    model = dl.Sequential([dl.Linear(64, 128), dl.ReLU(), dl.Linear(128, 10)], seed=0)
    trainer = dl.Trainer(model, loss="cross_entropy", optimizer=dl.SGD(lr=0.1, momentum=0.9),
                         plan=dl.Plan(replicas=2, stages=2, micro_batches=4, schedule="1f1b"),
                         pilot=pilot)
    history = trainer.fit(X, y, epochs=15, batch_size=64)
    trainer.evaluate(X, y); trainer.parameters(); trainer.predict(X)

Modules: ``layers`` (the numpy layers), ``losses``, ``optim`` (SGD, Adam), ``model``
(Sequential), ``plan`` (Plan, partition, reduction tree), ``schedules`` (GPipe, 1F1B,
the step's task graph), ``arena`` (shared memory), ``program`` (what tasks run),
``across_hosts`` (Transport; workers on other hosts: arrays as task results),
``trainer`` (Trainer), ``torch_module`` (TorchModule).  docs/dl.md explains the design.
"""

from .across_hosts import Transport
from .layers import Conv2d, Ctx, Dropout, Flatten, Layer, Linear, MaxPool2d, ReLU, ShapeError, Tanh
from .losses import Loss
from .model import Sequential
from .optim import SGD, Adam, Optimizer
from .plan import Plan, PlanError, Schedule
from .schedules import OpKind, ideal_bubble, step_graph
from .torch_module import TorchModule
from .trainer import Trainer

__all__ = [
    "Sequential", "Linear", "ReLU", "Tanh", "Conv2d", "MaxPool2d", "Flatten", "Dropout", "Layer",
    "Ctx", "SGD", "Adam", "Optimizer", "Plan", "Schedule", "PlanError", "ShapeError", "Loss",
    "Trainer", "Transport", "TorchModule", "OpKind", "step_graph", "ideal_bubble",
]
