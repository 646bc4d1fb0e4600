"""The torch-internals boundary: the only package that calls torch's private functions.

* :mod:`rayguard._torch.flight_recorder`: reads torch's Flight Recorder (the per process
  group ring buffer of collectives that ``torch._C._distributed_c10d`` keeps for gloo and
  NCCL) as plain data: per group, the last collective entered and the last completed;
* :mod:`rayguard._torch.counting`: rayguard's own counting hook on the
  ``torch.distributed`` collective functions, for a torch that records nothing;
* :mod:`rayguard._torch.groups`: leaving a broken default group (NCCL: abort) so that live
  recovery can form it again in the same process.

Each degrades to "nothing known" (``{}``) when the installed torch lacks what it reads:
the hang diagnosis then names only the ranks that gave no answer.
"""

__all__: list[str] = []
