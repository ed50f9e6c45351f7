from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Recipes, plans and runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from marin_site.pagecache import invalidate_on_change
        from runs import (
            models,
            permissions,  # noqa: F401  (registers the rules)
            series,  # noqa: F401  (refreshes a run's charts when it ends)
        )
        from runs.alerts import receivers, tasks  # noqa: F401  (alerts close with their run)

        invalidate_on_change(
            models.Recipe,
            models.RecipeEvent,
            models.Plan,
            models.PlanLaunch,
            models.Run,
            models.RunEvent,  # on the proposal page's timeline too
            models.Alert,
        )
