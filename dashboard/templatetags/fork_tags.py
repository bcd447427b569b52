"""The run page's fork links (SPEC §14): which run (and step) a run was forked from, its
forks, and a ``contextMode: "fork"`` child's parent step; read here so the run page's view
stays as it is."""

from django import template

from delegation.selectors.forks import child_fork_step, fork_links, fork_relation

register = template.Library()


@register.simple_tag
def forks_of(run) -> dict:
    return {**fork_links(run), "childStep": child_fork_step(run)}


@register.simple_tag
def fork_relation_of(a_run_id: str, b_run_id: str) -> str:
    return fork_relation(a_run_id, b_run_id)
