package storage_test

import (
	"context"
	"testing"

	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
)

// named is a table keyed by a client's identifier, as products are by SKU.
type named struct {
	Name string `gorm:"primaryKey;size:64"`
}

// TestMigratedTablesCompareIdentifiersByteForByte: on MySQL every table
// compares its strings byte for byte, as SQLite and the lock and Redis
// keys built from them do: two names that differ only in case are two
// rows, and neither matches the other. A table an earlier version created
// under the server's case-insensitive default is converted too, with its
// rows.
func TestMigratedTablesCompareIdentifiersByteForByte(t *testing.T) {
	ctx := context.Background()
	db, err := storage.Open(ctx, storage.Options{MySQLDSN: shoptest.MySQL(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Exec("CREATE TABLE nameds (name VARCHAR(64) NOT NULL PRIMARY KEY) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci").Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("INSERT INTO nameds (name) VALUES ('Phone-X')").Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx, &named{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Create(&named{Name: "phone-x"}).Error; err != nil {
		t.Fatalf("phone-x beside Phone-X: %v", err)
	}
	for _, name := range []string{"phone-x", "Phone-X"} {
		var found []named
		if err := db.Where("name = ?", name).Find(&found).Error; err != nil || len(found) != 1 || found[0].Name != name {
			t.Errorf("name = %q found %v (%v), want only %q", name, found, err, name)
		}
	}
	var none int64
	if err := db.Model(&named{}).Where("name = ?", "PHONE-X").Count(&none).Error; err != nil || none != 0 {
		t.Errorf("PHONE-X matched %d rows (%v), want 0", none, err)
	}
}
