"""Development tools of hoss: the real local control plane, the demo and the command that drives them and the
benchmark (``python -m dev``). Never installed with hoss, never in its image; nothing an operator installs imports
this package."""
