"""plugins/lookup/setting.py: another stage role's setting as that role sees it (a real
ansible-playbook run on localhost, with the project's roles' defaults)."""

from __future__ import annotations

from pathlib import Path

from playrun import run_cases


def test_the_owning_roles_default_unless_given(tmp_path: Path) -> None:
    cases = [
        {
            "name": "default",
            "ansible.builtin.set_fact": {
                "v": "{{ lookup('specfleet.ascend.setting', 'data_seq_length') }}"
            },
        },
        {
            "name": "given",
            "ansible.builtin.set_fact": {
                "v": "{{ lookup('specfleet.ascend.setting', 'train_nproc_per_node') }}"
            },
            "vars": {"train_nproc_per_node": 3},
        },
        {
            "name": "unknown",
            "ansible.builtin.set_fact": {
                "v": "{{ lookup('specfleet.ascend.setting', 'data_no_such') }}"
            },
        },
        {
            "name": "no role",
            "ansible.builtin.set_fact": {
                "v": "{{ lookup('specfleet.ascend.setting', 'nobody_x') }}"
            },
        },
    ]
    # data's default is templated in data's scope: 512 on the cpu profile (8192 on npu).
    run = run_cases(tmp_path, cases, {"specfleet_env": {"profile": "cpu"}}, roles=["specfleet"])
    assert run.results["default"]["ansible_facts"]["v"] == 512, run.results["default"]
    assert run.results["given"]["ansible_facts"]["v"] == 3
    assert "role data has no setting data_no_such" in run.results["unknown"]["msg"]
    assert "nobody_x is neither given nor a stage role's setting" in run.results["no role"]["msg"]
