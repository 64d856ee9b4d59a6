"""pytest plugin for mutation runs (-p noshrink): hypothesis stops at the first failing example.

A killed mutant needs only the failure, not a minimal example; shrinking took up to half a
minute per mutant on the two-core machine.
"""

from hypothesis import Phase, settings

settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile("mutation")
