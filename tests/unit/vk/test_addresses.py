from vk.forge.addresses import identity, remapper


def test_a_provider_pod_address_is_seen_in_its_remapped_prefix() -> None:
    remap = remapper(["10.244.0.0/16", "10.245.0.0/16"], ["10.70.0.0/16", "10.71.0.0/16"])
    assert remap("10.244.1.10") == "10.70.1.10"
    assert remap("10.245.255.1") == "10.71.255.1"
    assert remap("192.168.1.5") == "192.168.1.5", "host-network pods keep their address"
    assert remap("fd00::7") == "fd00::7" and remap("not-an-ip") == "not-an-ip"


def test_pairs_that_do_not_line_up_are_not_used() -> None:
    assert remapper([], []) is identity
    assert remapper(["10.244.0.0/16"], ["10.70.0.0/24"]) is identity  # sizes differ: not 1:1
    assert remapper(["10.244.0.0/16"], ["garbage"]) is identity
