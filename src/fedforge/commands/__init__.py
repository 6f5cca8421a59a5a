"""What the ``fedforge`` commands share: where they print, how a user's error becomes one
line (:mod:`~fedforge.commands.output`), the options several commands take and what those
options do before a command runs (:mod:`~fedforge.commands.options`).

The commands themselves are :mod:`fedforge.cli`; what each command does lives in the
module it calls.
"""
