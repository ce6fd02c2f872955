"""The records the engine, the executors and the model runner share: a step's plan (``step``) and a request's
sampling parameters (``sampling_params``). No torch; imports nothing of attnserve above ``config`` and
``refusals``, so every package from ``model_executor`` up may import it."""
