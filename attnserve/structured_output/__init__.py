"""Structured outputs: a request's output held to a JSON schema, regex, choice or grammar.

The engine's :class:`~attnserve.structured_output.manager.StructuredOutputManager` compiles each constraint once
(cached by its source; ``backend_xgrammar.py``), keeps one grammar matcher per constrained request, advances it
with each accepted token and fills a step's token bitmask on the host; the model runner applies the bitmask to
the logits on the device before sampling (``bitmask.py``). xgrammar is an optional extra
(``pip install 'attnserve[structured]'``): ``import attnserve`` works without it, a constrained request does not.
"""
