"""specfleet.ascend.template: a template file rendered as ansible.builtin.template's lookup
renders it, without the lookup's deep copy of every variable of the task first.

That copy (its own FIXME asks for a ChainMap instead) took 40 % of each lookup here: the task's
variables hold every stage's declaration and the earlier runs' stamps. The stage scripts
(plugins/action/specfleet_stage_decide.py), the host environment wrapper and the report's
input are rendered on every run, no-op runs included.

    stdin: "{{ lookup('specfleet.ascend.template', 'hosts.json.j2') }}"

Found as the builtin lookup finds it (the role's templates/, then the play's), its directory
first in the include path; no backslash escaping; the same Jinja settings. The template_*
variables the builtin adds (template_path, template_host, ...) and ansible_managed are not
set: no specfleet template reads them.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.specfleet.ascend.plugins.plugin_utils.templates import render_file

DOCUMENTATION = """
name: template
short_description: render a template file as ansible.builtin.template's lookup does, faster
description:
  - Renders each template file given, found in the role's and the play's templates/ as the
    builtin lookup finds it, over the task's variables without copying them first.
  - The template_* variables and ansible_managed are not set.
options:
  _terms:
    description: the template files
    required: true
"""


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[str]:
        if kwargs:
            raise AnsibleLookupError(
                f"specfleet.ascend.template: takes no options, got {', '.join(sorted(kwargs))}"
            )
        rendered = []
        for term in terms:
            path = self.find_file_in_search_path(variables, "templates", term)
            if not path:
                raise AnsibleLookupError(
                    f"specfleet.ascend.template: the template file {term} could not be found"
                )
            rendered.append(render_file(self._templar, self._loader, path, variables or {}))
        return rendered
