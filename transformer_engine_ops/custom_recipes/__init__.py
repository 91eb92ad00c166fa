"""TE's ``custom_recipes``: quantizer factories for ``te.recipe.CustomRecipe``
(``custom_recipes.quantizer_factories``)."""
