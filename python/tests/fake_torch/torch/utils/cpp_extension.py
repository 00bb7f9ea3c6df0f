import os


def include_paths(*args, **kwargs):
    # The stand-in c10 headers of the tests (tests/fake_c10), named by the test.
    return [os.environ["FAKE_C10_INCLUDE"]]
