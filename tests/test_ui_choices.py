from forgetlab.ui.choices import index_of


def test_index_of_prefers_the_named_option_and_falls_back_to_the_first():
    assert index_of(["translate", "math", "code"], "math") == 1
    assert index_of(("copy", "upper"), "math") == 0
    assert index_of({"ties": 1, "pcb": 2}, "pcb") == 1          # a dict's keys, as the Merge page passes METHODS
