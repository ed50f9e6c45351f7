from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Recipes, plans and runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing these registers the permission rules and connects every receiver.
        from marin_site import invalidation
        from runs import permissions, receivers  # noqa: F401
        from runs.campaigns import permissions as campaign_permissions  # noqa: F401
        from runs.invalidation import RULES

        invalidation.register("runs", *RULES)
        from runs.imports import register_all

        register_all()
