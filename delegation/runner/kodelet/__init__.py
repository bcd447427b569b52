"""Hosting kodelet's own extensions in the reference runner (SPEC §15).

- :mod:`.framing`: kodelet's extension wire, ``Content-Length``-framed JSON-RPC 2.0 on stdio;
- :mod:`.spec`: a preset's ``extensions`` field, checked when the presets file loads;
- :mod:`.hosted`: one extension process for one run, its host methods mapped onto Canopy;
- :mod:`.bridge`: the runner's end of the ``kodelet`` the extension starts (a local socket);
- :mod:`.acp`: that ``kodelet`` (``kodelet acp``): ACP v1 on stdio, each session a child run;
- :mod:`.engine`: wraps an engine so the runs of a preset with extensions get them.

Nothing here imports Django: the runner runs where Canopy's server does not.
"""
