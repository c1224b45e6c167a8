"""The driver room: what runs a job in the driver process, each command's one entry function.

- `training`: ``gyre train``, the online-RL loop (`train`, `Trainer`), and ``--resume`` (`pick_up`);
- `evaluation`: ``gyre eval`` (`run_eval`);
- `sft`: ``gyre sft``, the supervised warm start (`run_sft`);
- `pretrain`: ``gyre pretrain``, the quickstart's starting model;
- `quickstart`: ``gyre quickstart``, pretrained -> SFT -> RL, evaluated before and after each;
- `rundir`: the run directory all of them write (`RunDir`);
- `runreport`: ``report.html`` of a run directory (``gyre report``);
- `view`: the live terminal view of ``gyre train``;
- `eventloop`: the event loop and collector every driver entry point runs its coroutine on.

Importing this package imports none of them: each is imported where it is used, so ``gyre --help`` stays instant.
"""
