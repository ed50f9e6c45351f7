"""The project's recipes as reviewed YAML files in this folder, and how they are read.

``files`` reads and checks a recipe file (no Django: the trainer reads its defaults from
here too); ``demo`` names the project's own recipes for the demo data, tests and benches.
``manage.py load_recipes`` registers the files through ``runs.services.recipes``.
"""
