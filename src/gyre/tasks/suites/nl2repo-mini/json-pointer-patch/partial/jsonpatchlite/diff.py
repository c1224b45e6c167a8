"""Generate JSON patches (not written yet)."""


def make_patch(a, b):
    raise NotImplementedError
