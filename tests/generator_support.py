"""``generator_support`` for the tests that still import it by that name (test_sampler_chain.py): the helpers live in
:mod:`specstate_testkit.generator_support`. Remove once no test imports ``generator_support``."""

from specstate_testkit.generator_support import *  # noqa: F403
