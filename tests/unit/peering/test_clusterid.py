"""How a cluster's ID is settled, the same for peer (which records it) and install (whose chart
does): the recorded one stands, a different one asked for is refused, else the one asked for or
one derived from the kubeconfig context."""

from __future__ import annotations

import pytest

from peering.clusterid import ClusterIDError, choose_cluster_id


def test_the_recorded_id_stands_and_a_rename_is_refused() -> None:
    assert choose_cluster_id("ml-eu", None, "ctx") == "ml-eu"
    assert choose_cluster_id("ml-eu", "ml-eu", "ctx") == "ml-eu"
    with pytest.raises(ClusterIDError, match=r"already known as 'ml-eu'.*cannot also be 'gpu-farm'"):
        choose_cluster_id("ml-eu", "gpu-farm", "ctx")


def test_without_a_record_the_id_asked_for_or_one_derived_from_the_context() -> None:
    assert choose_cluster_id(None, "gpu-farm", "ctx") == "gpu-farm"
    assert choose_cluster_id(None, None, "Admin@Prod_EU") == "admin-prod-eu"
    with pytest.raises(ClusterIDError, match="invalid cluster ID"):
        choose_cluster_id(None, "Not_Valid", "ctx")
