"""The auto-tuning agent (offline, ``cosparse tune``): a search over the engine's exact knobs on
Optuna, each trial a short real run of the engine, with budgets as constraints, an exactness
veto, and an audit journal that ``--replay`` re-derives the decision from.

It sits above ``train`` (a trial runs the trainer), so it is its own package: ``cosparse.tune``,
the capacity planner, sits below ``train``, which uses its hotness curves.
"""
