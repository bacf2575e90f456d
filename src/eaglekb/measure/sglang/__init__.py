"""The SGLang backend, in one package: everything eaglekb does with an SGLang server.

- ``config``: the server settings a run uses (``LaunchConfig``) and the ``sglang.launch_server`` argv.
- ``stack``: the pinned serving stack for a GPU host without registry access (pack, install).
- ``server``: a launched server's life (launch, health, identity, stop).
- ``bench``: ``invoke bench.sglang`` (SGLang plain and EAGLE-3 beside our engine: speed, parity, concurrency).
- ``trace``: the decode cycle split from SGLang's torch profiler (``invoke sglang.profile``).
- ``plan``: break-even before training (``invoke plan.sglang``: an untrained drafter of the target's shape).

The HTTP client (``eaglekb.models.server.SGLangClient``) sits lower, in ``models``, because datagen also talks
to a server through it; nothing here is imported by the layers below ``measure``.
"""
