"""``import models`` for the tests that still import it by that name (test_llama_api.py): the builders live in
:mod:`specstate_testkit.models`. Remove once no test imports ``models``."""

from specstate_testkit.models import *  # noqa: F403
