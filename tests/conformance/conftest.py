"""The fake TE checkout under fake_te/ is input to the conformance runner, not tests of
this project."""

collect_ignore = ["fake_te"]
