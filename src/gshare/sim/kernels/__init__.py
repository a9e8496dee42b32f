"""The kernel-level GPU model: tasks as launch streams on a time-sliced device (docs/DESIGN.md §11).

* ``catalogue`` — the shipped V100 kernel profiles, calibrated to the V100 table (``task_model``);
* ``device`` — ``KernelDevice``: NVIDIA's default time-slicing between processes;
* ``gates`` — when a launch may reach the device: sharing, exclusive, FIKIT (``policy.priority``);
* ``stream`` — ``HostStream``: one process's host thread and its interception costs;
* ``scenario`` — ``run_scenario`` (services × mode) and ``measure_profile`` (FIKIT's
  measurement phase).

``sim.gpu`` (bursts under tokens) is unchanged; this model is separate and used by the
``fikit-*`` experiments.
"""
