from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_campaigns"),
        ("runs", "0009_recipe_and_launch_requires_labels"),
    ]

    operations = []
