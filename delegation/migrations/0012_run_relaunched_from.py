import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delegation", "0011_retention_and_sso")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="relaunched_from",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="relaunches",
                to="delegation.run",
            ),
        ),
    ]
