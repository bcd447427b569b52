"""Operator roles (SPEC §7): viewer reads, operator also acts, admin also manages tokens."""

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)
_RANK = {None: 0, VIEWER: 1, OPERATOR: 2, ADMIN: 3}
# Set on a user authenticated by a read-only API token: it reads, never acts.
READ_ONLY_SCOPE = "canopy_read_only"


def role_of(user) -> str | None:
    """The strongest role a user holds; superusers are admins, anonymous users have none."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return None
    if user.is_superuser:
        role = ADMIN
    else:
        names = {group.name for group in user.groups.all()}
        role = next((r for r in (ADMIN, OPERATOR, VIEWER) if r in names), None)
    if role is not None and getattr(user, READ_ONLY_SCOPE, False):
        return VIEWER
    return role


def has_role(user, role: str) -> bool:
    return _RANK[role_of(user)] >= _RANK[role]


def can_view(user) -> bool:
    return has_role(user, VIEWER)


def can_act(user) -> bool:
    return has_role(user, OPERATOR)


def can_admin(user) -> bool:
    return has_role(user, ADMIN)
