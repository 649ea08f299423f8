#!/usr/bin/perl

# Sync over https: a root serving TLS with a throwaway CA and both tokens; nginx verifies
# it with yarl_sync_ca and sends yarl_sync_token. A CA that did not sign the root's
# certificate, or a wrong token, fails the sync with a reason in yarl_stats, never a request.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);

my $t = Test::Yarl->new();
my $dir = $t->testdir;
$t->write_file('index.html', "hello\n");
for my $ca ('', 'other') {
	system("$FindBin::Bin/../scripts/make-test-ca.sh '$dir/$ca' >/dev/null") == 0 or die "make-test-ca.sh\n";
}
$t->write_file('admin.token', "admin-secret-1\n");
$t->write_file('sync.token', "sync-secret-2\n");
chmod 0600, "$dir/admin.token", "$dir/sync.token";
$t->run_root('A', '--tls-cert', "$dir/server.pem", '--tls-key', "$dir/server.key",
	'--admin-token-file', "$dir/admin.token", '--sync-token-file', "$dir/sync.token");
my $root = 'https://127.0.0.1:' . $t->port('ROOT_A');

sub conf {
	my ($ca, $token) = @_;
	$t->write_http_conf(<<"EOF2");
    yarl_roots $root;
    yarl_sync_ca $ca;
    yarl_sync_token $token;
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / {
            yarl_account q;
        }
        location = /stats {
            yarl_stats;
        }
    }
EOF2
}

# The admin API over TLS with its token (curl: Perl's core has no TLS client).
my $put = `curl -s --cacert $dir/ca.pem -H 'Authorization: Bearer admin-secret-1' -X PUT $root/v1/quotas/q -d '{"limit":0.001,"low_burst":2,"high_burst":2,"parent":null}'`;
like($put, qr/"name":"q"/, 'quota created over https with the admin token');
my $anon = `curl -s -o /dev/null -w '%{http_code}' --cacert $dir/ca.pem -X PUT $root/v1/quotas/x -d '{"limit":1,"low_burst":1,"high_burst":1,"parent":null}'`;
is($anon, '401', 'without the admin token: 401');

conf("%%TESTDIR%%/ca.pem", 'sync-secret-2');
$t->run();
ok($t->wait_quota($t->port(8080), 'q', 5), 'nginx fetched the quota over https');
my $s = $t->stats($t->port(8080));
is($s->{roots}[0]{url}, $root, 'the root is an https URL');
is($s->{roots}[0]{ok}, JSON::PP::true(), 'the last sync succeeded');
is(status_of(http_get($t->port(8080), '/index.html')), 200, "request $_") for 1 .. 3;
is(status_of(http_get($t->port(8080), '/index.html')), 429, 'the quota limits');
my $fill = sub {
	my $b = `curl -s --cacert $dir/ca.pem -H 'Authorization: Bearer admin-secret-1' $root/v1/quotas/q`;
	return $b =~ /"fill":([\d.]+)/ ? $1 : -1;
};
ok($t->wait_for(sub { $fill->() >= 1.99 }, 5), 'the root counted the requests (over https; its ceiling is high_burst)');

# A CA that did not sign the root's certificate.
conf("%%TESTDIR%%/other/ca.pem", 'sync-secret-2');
ok($t->reload(), 'reload with another CA');
ok($t->wait_for(sub {
	my $s = $t->stats($t->port(8080));
	$s && !$s->{roots}[0]{ok} && ($s->{roots}[0]{last_error} // '') =~ /certificate|issuer/i;
}, 5), 'the sync fails on the certificate') or diag(explain($t->stats($t->port(8080))));

# The right CA, the wrong token.
conf("%%TESTDIR%%/ca.pem", 'wrong-token');
ok($t->reload(), 'reload with a wrong token');
ok($t->wait_for(sub {
	my $s = $t->stats($t->port(8080));
	$s && !$s->{roots}[0]{ok} && ($s->{roots}[0]{last_error} // '') =~ /401/;
}, 5), 'the sync is refused with 401') or diag(explain($t->stats($t->port(8080))));
is(status_of(http_get($t->port(8080), '/index.html')), 429, 'requests are still decided locally');

$t->finish();
done_testing();
