"""Runnable examples: each module defines a workflow and a ``SCENARIO`` for the verifier.

From the repository root::

    crashproof verify examples.patch_task:SCENARIO
    crashproof verify examples.code_agent:SCENARIO --mode subprocess --max-points 20
    crashproof verify examples.openai_agent:SCENARIO --mode powercut
"""
